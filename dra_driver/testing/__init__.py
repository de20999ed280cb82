"""Test doubles shipped with the driver: emulated inventories, device roots, fakes."""
