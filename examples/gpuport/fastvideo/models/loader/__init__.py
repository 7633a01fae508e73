"""Official checkpoint → port conversion."""
