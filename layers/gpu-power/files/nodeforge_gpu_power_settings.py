"""nodeforge-gpu-power's settings: the JSON file the layer writes, with the command line winning over it.

Installed beside the library in /usr/lib/python3/dist-packages (see layers/gpu-power/layer.yaml).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """A configuration or argument error (exit 2)."""


@dataclass
class Settings:
    power_limit_w: float = 0
    power_overrides: dict[int, float] | None = None
    clocks: tuple[int, int] | None = None
    clock_overrides: dict[int, tuple[int, int] | None] | None = None
    attempts: int = 3
    retry_delay_s: float = 2
    low_util: float = 20
    high_util: float = 60
    down_samples: int = 3
    up_samples: int = 1
    step_w: float = 50
    raise_step_w: float = 0
    floor_w: float = 0
    interval_s: float = 15
    state: str = "/run/nodeforge-gpu-power/governor.json"

    def power_for(self, index: int) -> float:
        overrides = self.power_overrides or {}
        return overrides.get(index, self.power_limit_w)

    def clocks_for(self, index: int) -> tuple[int, int] | None:
        overrides = self.clock_overrides or {}
        return overrides.get(index, self.clocks)


def parse_power_overrides(items: list[str]) -> dict[int, float]:
    result: dict[int, float] = {}
    for item in items:
        index, sep, value = str(item).partition(":")
        try:
            if not sep:
                raise ValueError
            result[int(index)] = float(value)
        except ValueError as e:
            raise UsageError(f"power override {item!r}: expected INDEX:WATTS such as 3:500") from e
        if result[int(index)] < 0 or int(index) < 0:
            raise UsageError(f"power override {item!r}: index and watts must not be negative")
    return result


def parse_clocks(text: str, what: str) -> tuple[int, int] | None:
    """'MIN,MAX' in MHz; '0' or '' means leave the clocks as they are."""
    text = text.strip()
    if text in ("", "0", "0,0"):
        return None
    try:
        low, high = (int(v) for v in text.split(","))
    except ValueError as e:
        raise UsageError(f"{what} {text!r}: expected MIN,MAX in MHz such as 1410,1980") from e
    if low < 0 or high <= 0 or low > high:
        raise UsageError(f"{what} {text!r}: need 0 <= MIN <= MAX and MAX > 0")
    return low, high


def parse_clock_overrides(items: list[str]) -> dict[int, tuple[int, int] | None]:
    result: dict[int, tuple[int, int] | None] = {}
    for item in items:
        index, sep, value = str(item).partition(":")
        if not sep or not index.strip().isdigit():
            raise UsageError(f"clock override {item!r}: expected INDEX:MIN,MAX such as 3:1410,1980")
        result[int(index)] = parse_clocks(value, f"clock override {item!r}")
    return result


def load_settings(args: argparse.Namespace) -> Settings:
    raw: dict[str, Any] = {}
    if args.config:
        try:
            raw = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read {args.config}: {e}") from e
    governor = raw.get("governor", {})
    s = Settings()
    s.power_limit_w = float(raw.get("power_limit_w", 0))
    s.power_overrides = parse_power_overrides(list(raw.get("power_limit_overrides", [])))
    s.clocks = parse_clocks(str(raw.get("clocks_mhz", "")), "clocks")
    s.clock_overrides = parse_clock_overrides(list(raw.get("clock_overrides", [])))
    s.attempts = int(raw.get("verify_attempts", 3))
    s.retry_delay_s = float(raw.get("retry_delay_s", 2))
    for key in ("low_util", "high_util", "step_w", "raise_step_w", "floor_w", "interval_s"):
        if key in governor:
            setattr(s, key, float(governor[key]))
    for key in ("down_samples", "up_samples"):
        if key in governor:
            setattr(s, key, int(governor[key]))
    s.state = str(governor.get("state", s.state))
    # the command line wins over the file
    if args.power_limit is not None:
        s.power_limit_w = args.power_limit
    if args.override:
        s.power_overrides = {**(s.power_overrides or {}), **parse_power_overrides(args.override)}
    if args.clocks is not None:
        s.clocks = parse_clocks(args.clocks, "--clocks")
    if args.clock_override:
        s.clock_overrides = {**(s.clock_overrides or {}), **parse_clock_overrides(args.clock_override)}
    for key in ("attempts", "retry_delay_s", "low_util", "high_util", "down_samples", "up_samples",
                "step_w", "raise_step_w", "floor_w", "interval_s", "state"):
        value = getattr(args, key, None)
        if value is not None:
            setattr(s, key, value)
    if s.power_limit_w < 0:
        raise UsageError(f"power limit {s.power_limit_w} W: must not be negative (0 leaves it)")
    if s.attempts < 1:
        raise UsageError("attempts must be at least 1")
    if not 0 <= s.low_util < s.high_util <= 100:
        raise UsageError(f"governor thresholds: need 0 <= low ({s.low_util}) < high ({s.high_util}) <= 100")
    if s.down_samples < 1 or s.up_samples < 1 or s.step_w <= 0:
        raise UsageError("governor: samples must be at least 1 and the step positive")
    return s
