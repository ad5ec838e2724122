#!/bin/sh
# The one compile line of a plugin, word for word as docs/plugins.md and README.md give it:
# run from a folder holding include/atrium/ (the public headers, nothing else of Atrium)
# and examples/media-disk/. examples/CMakeLists.txt builds the example with it, and
# tests/integration/test_plugin_build.py runs it outside the tree.
set -e
cc -std=c17 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -I include $(pkg-config --cflags jansson libpq) examples/media-disk/media_disk.c $(pkg-config --libs jansson libpq) -o media_disk.so
