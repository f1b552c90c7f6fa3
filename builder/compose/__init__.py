"""Stage 2, compose: the layer graph, parameters, rendering and contributions, into a frozen BuildPlan."""

from .image import compose

__all__ = ["compose"]
