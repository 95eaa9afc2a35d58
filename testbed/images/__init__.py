"""Container images for ``runtime: docker`` hosts (the testbed's own trainer image, and checks of others)."""
