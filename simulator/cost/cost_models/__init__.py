"""Shipped step-time cost models (JSON); load them by name with simulator.cost.loading.load_cost_model."""
