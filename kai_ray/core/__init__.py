"""kai_ray.core."""
