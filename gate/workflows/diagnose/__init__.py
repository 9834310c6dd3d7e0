"""Locating a failure at its layer and part: captures, the honest band, its cache and variants."""
