// Declaration shim, see gloo_shim/gloo/README.md.
#pragma once
