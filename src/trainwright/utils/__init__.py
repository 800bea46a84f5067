"""Small helpers shared across the package: loop counters, seeding, importing config-named modules."""
