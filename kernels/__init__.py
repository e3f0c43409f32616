"""Compute kernels (Triton) and the torch references they are tested against. No scheduling logic."""
