"""The fleet cache: keyed engine images shared between build machines through an OCI registry,
each entry signed by the machine that built it and verified by the one that pulls it."""
