"""Applications built on flownet."""
