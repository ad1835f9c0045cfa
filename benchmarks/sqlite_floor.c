/* The least any reader of a recording through SQLite pays: every row of every table
 * stepped and every value fetched in C, nothing checked, nothing summed but a checksum.
 *
 *   gcc -O2 -o /tmp/sqlite_floor benchmarks/sqlite_floor.c -lsqlite3
 *   /tmp/sqlite_floor RECORDING.probe.db
 *
 * Prints, per table, the rows, the values fetched and the CPU seconds (user + system of
 * this process), then PRAGMA quick_check's CPU seconds, then the totals. Run it twice:
 * the first run also pays reading the file into the page cache.
 */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s RECORDING\n", argv[0]);
    return 2;
  }
  sqlite3 *db;
  if (sqlite3_open_v2(argv[1], &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    fprintf(stderr, "sqlite_floor: %s\n", sqlite3_errmsg(db));
    return 1;
  }
  sqlite3_exec(db, "PRAGMA cache_size=-65536; PRAGMA mmap_size=0", NULL, NULL, NULL);
  char names[64][128];
  int ntables = 0;
  sqlite3_stmt *st;
  sqlite3_prepare_v2(db,
                     "SELECT name FROM sqlite_schema WHERE type='table' AND name NOT LIKE "
                     "'sqlite_%' ORDER BY name",
                     -1, &st, NULL);
  while (sqlite3_step(st) == SQLITE_ROW && ntables < 64)
    snprintf(names[ntables++], 128, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);

  uint64_t check = 0, all_rows = 0, all_values = 0;
  double all_s = 0;
  printf("%-24s %14s %14s %9s %9s\n", "table", "rows", "values", "CPU s", "ns/value");
  for (int t = 0; t < ntables; t++) {
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT * FROM \"%.127s\"", names[t]);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) continue;
    int ncol = sqlite3_column_count(st);
    uint64_t rows = 0;
    double t0 = cpu_s();
    while (sqlite3_step(st) == SQLITE_ROW) {
      rows++;
      for (int c = 0; c < ncol; c++) {
        switch (sqlite3_column_type(st, c)) {
          case SQLITE_INTEGER:
            check += (uint64_t)sqlite3_column_int64(st, c);
            break;
          case SQLITE_FLOAT:
            check += (uint64_t)sqlite3_column_double(st, c);
            break;
          case SQLITE_TEXT:
          case SQLITE_BLOB:
            check += (uint64_t)sqlite3_column_bytes(st, c);
            break;
          default:
            break;
        }
      }
    }
    double s = cpu_s() - t0;
    sqlite3_finalize(st);
    uint64_t values = rows * (uint64_t)ncol;
    printf("%-24s %14llu %14llu %9.2f %9.1f\n", names[t], (unsigned long long)rows,
           (unsigned long long)values, s, values ? s * 1e9 / values : 0.0);
    all_rows += rows;
    all_values += values;
    all_s += s;
  }
  double t0 = cpu_s();
  sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &st, NULL);
  const char *qc = "";
  char qcbuf[64] = "";
  if (sqlite3_step(st) == SQLITE_ROW) {
    qc = (const char *)sqlite3_column_text(st, 0);
    snprintf(qcbuf, sizeof qcbuf, "%s", qc ? qc : "");
  }
  sqlite3_finalize(st);
  double qs = cpu_s() - t0;
  printf("%-24s %14s %14s %9.2f %9s  (%s)\n", "PRAGMA quick_check", "", "", qs, "", qcbuf);
  printf("%-24s %14llu %14llu %9.2f %9.1f\n", "every table", (unsigned long long)all_rows,
         (unsigned long long)all_values, all_s, all_values ? all_s * 1e9 / all_values : 0.0);
  printf("%-24s %14s %14s %9.2f   (checksum %llu)\n", "with quick_check", "", "", all_s + qs,
         (unsigned long long)check);
  sqlite3_close(db);
  return 0;
}
