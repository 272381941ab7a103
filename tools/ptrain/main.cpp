// The ptrain command line. Everything it does lives in the core (cli.h); this
// file only turns errors into one line and an exit code.
#include "ptrain/cli/cli.h"

int main(int argc, char** argv) { return ptrain::cli::main(argc, argv); }
