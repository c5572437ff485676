"""What the controllers share: informers, the keyed work queue, operator-wide defaults."""
