/* A libucp.so.0 without UCX in it: put first on LD_LIBRARY_PATH, it stands
 * for a machine whose UCX is missing or unusable (the bootstrap library then
 * fails to load with "undefined symbol: ucp_..."). */
int arbiter_fake_ucp = 1;
