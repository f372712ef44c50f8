"""deepdanbooru: train multi-label image taggers from a project directory.

Importing the package must stay cheap: no TensorFlow here.
"""

__version__ = "2.0.0.dev0"
