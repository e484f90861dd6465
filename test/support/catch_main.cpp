// Catch2 v2 (Debian bookworm ships 2.13) main, compiled once into mtnlg_testlib.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
