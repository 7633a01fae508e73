"""A miniature stand-in for the FastVideo package: just enough structure
(models/dits, models/vaes, models/loader, layers) to host the TinyPort port."""
