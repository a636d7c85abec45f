"""Reference implementations that the tests compare the library against."""
