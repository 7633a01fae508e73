"""Hooks the port runs with: activation tracing for parity debugging."""
