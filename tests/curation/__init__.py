"""Tests of the curation taggers."""
