"""Shared layers."""
