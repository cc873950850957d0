#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

static int add(int a, int b) { return a + b; }
static int sub(int a, int b) { return a - b + 1; }  // the bug

TEST_CASE("calc") {
    SUBCASE("adds") { CHECK(add(1, 2) == 3); }
    SUBCASE("subtracts") { CHECK(sub(3, 1) == 2); }
    SUBCASE("mixed <&> \"quotes\"") {
        CHECK(add(1, 1) == 2);
        CHECK(sub(1, 1) == 0);
    }
}

TEST_CASE("no subcases") { CHECK(add(0, 0) == 0); }
