"""Tests of the pure core."""
