"""Helpers shared by every test folder: catalogs, principals, directives, clocks, waiting and serving."""
