"""One module per algorithm: its learner (torch) and, apart, its acting half (numpy). No ray.

Which module holds which algorithm is in `distrl.registry`.
"""
