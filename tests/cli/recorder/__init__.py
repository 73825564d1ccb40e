"""Tests of recorder."""
