"""Tests of the api room."""
