"""Recipes: end-to-end runs that chain prepare, train and eval (the demo)."""
