"""kai_ray.core: the pure scheduling core (snapshot in, decisions out)."""
