"""Tests that need a GPU (marked `gpu`), and the CPU test of the script that runs them."""
