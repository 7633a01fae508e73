"""FastVideo model implementations."""
