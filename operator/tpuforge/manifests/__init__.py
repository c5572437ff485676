"""Pure functions from api objects to Kubernetes objects: one module per kind plus the shared `common`.
No I/O and no clock: the same inputs always give the same objects."""
