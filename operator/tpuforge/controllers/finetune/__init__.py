"""The FineTuneJob controller."""
