// The source of the trainplan_pch target (CMakeLists.txt, TRAINPLAN_UNITY): it only carries the
// precompiled header that the libraries and the binary reuse.
