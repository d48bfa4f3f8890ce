"""Test double of Habana's ``habana_frameworks`` package (tests/hpu_double).

Only tests put it on sys.path; it is never installed with the plugin.
"""
