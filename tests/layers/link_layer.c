/* Linked with every object of one layer and nothing above it (see
 * CMakeLists.txt): the link fails if that layer calls a higher one. */
int main(void) { return 0; }
