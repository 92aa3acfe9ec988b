"""Shipped step-time cost models (JSON); load them by name with simulator.cost.cost_model.load_cost_model."""
