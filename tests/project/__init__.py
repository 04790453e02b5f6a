"""Tests of what stands around the package: the docs site, the Makefile, the compose deployment, bench
scripts.
"""
