"""Processes around the roles: the driver loop and the two ways of hosting the roles
(`local`: one process; `ray_roles`: Ray actors). The only package that imports ray."""
