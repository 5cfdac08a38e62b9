"""kai_ray.grouping."""
