"""Checkpoint loading and parameter-name mapping."""
