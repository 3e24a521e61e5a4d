/*
 * config_defaults.c -- prints the built-in value of each configuration key
 * named on the command line, one "key<TAB>value" line each, as
 * fiber_config_get() gives it before fiber_init().  tests/docs/config_keys.py
 * runs it with no FIBER_* variable and no .fiberconfig, so what it prints
 * is the code's defaults, to compare with docs/configuration.md.
 */
#include <stdio.h>

#include <fiber/fiber.h>

int main(int argc, char **argv)
{
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        char value[1024];
        int got = fiber_config_get(argv[i], value, sizeof value);
        if (got == 0) {
            printf("%s\t%s\n", argv[i], value);
        } else {
            fprintf(stderr, "config_defaults: %s: %s\n", argv[i],
                    fiber_last_error());
            rc = 1;
        }
    }
    return rc;
}
