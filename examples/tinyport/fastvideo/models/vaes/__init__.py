"""VAE decoders."""
