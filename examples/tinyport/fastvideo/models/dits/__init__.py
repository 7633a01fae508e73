"""Diffusion transformers and text backbones."""
