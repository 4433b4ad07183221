"""Each family's own spec dataclasses, one module per family key."""
