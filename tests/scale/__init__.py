"""Scale: models over 2 GB, memory bounds, Ray clusters."""
