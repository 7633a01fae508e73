"""A miniature stand-in for the FastVideo package: just enough structure
(models/encoders, models/loader, layers) to host the GpuPort port."""
