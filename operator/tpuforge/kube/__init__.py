"""The few Kubernetes API calls the operator makes: a client, its async twin, object helpers, Events."""
