"""DiTs."""
