"""Schedulers: direct, dynamic batcher; batch merge and split."""
