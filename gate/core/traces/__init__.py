"""Trace v1: records, the reader and writer, MoE routing fields, the machine key, shards."""
