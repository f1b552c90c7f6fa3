"""nodeforge: GPU node images and CUDA container images from layered declarative definitions.

Stages, each a subpackage; a module imports only from stages below it (tests/test_architecture.py):
cli > export > pipeline, verify, publish, diff > manifest > node > engine > compose > checks > definitions >
lockfile, plan, errors, debian, progress."""
