"""Air-gapped builds: `nodeforge mirror` gathers exactly the locked packages, wheels and bases of
images into a directory with a checksum index; `build --offline --mirror DIR` checks the index,
then builds with no network (index: the index and its check; repo: the flat apt repository;
gather: the mirror command's work; offline: what an offline build checks before it starts)."""
