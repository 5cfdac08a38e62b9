"""kai_ray.sim."""
