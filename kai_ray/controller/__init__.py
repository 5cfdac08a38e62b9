"""kai_ray.controller."""
