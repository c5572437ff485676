"""The ServingDeployment controller."""
