"""Stage 7, verification: results and matchers, per-kind judges, image, container, guest and boot
runners, reports."""
